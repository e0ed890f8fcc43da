"""The tool calls the reader keeps: columns, with ``ToolCall`` records made on demand.

At a million spans 500k ``ToolCall`` records take about 145 MB (144 bytes
each and about 140 bytes of ints: a Python int is 32-40 bytes); as
columns the same calls take about 60 MB: the times and span ids as
unsigned 64-bit ints in ``array("Q")`` (8 bytes each; the reader keeps
every time and id in [0, 2**64)), and the other fields as lists of the
reader's shared objects (8 bytes a reference). The statistics read the
columns (``report.columns``), the turns read them by row; whatever else iterates or indexes the table
gets a ``ToolCall`` made for it, which lives only while it is used.
The HTML and Perfetto outputs, which map the attribution's shares back to
their calls by identity, ``keep`` the records instead: then the table
hands out the same record for a call every time.

The reader adds a call as one tuple of its fields (``add_row``, or
``pending.append`` where a bound method saves a call per row): the rows
wait in ``pending`` and are moved into the columns a chunk at a time
(``flush``: a column extended by a chunk's values, not appended to once a
call, 14 times), and before anything reads a column or a row.

No numpy at import: the blame service's reader builds a table too
(``agent-otel gpu-exporter`` starts without numpy).
"""

from __future__ import annotations

from array import array
from itertools import islice, repeat
from operator import attrgetter, itemgetter
from typing import Any, Iterable, Iterator, Optional, Sequence, overload

from agent_otel.records import ToolCall
from agent_otel.semconv import OUTCOME_OK

# ToolCall's fields, in its constructor's order; which are 64-bit columns,
# and which mostly hold one value (such a column is None itself until
# another value comes: 8 bytes a call saved for each), with that value.
_FIELDS = (
    "tool",
    "executor",
    "submit_ns",
    "start_ns",
    "end_ns",
    "outcome",
    "call_id",
    "trace_id",
    "span_id",
    "error_type",
    "thread",
    "executor_workers",
    "pool",
    "cpu_ns",
)
_WORDS = frozenset({"submit_ns", "start_ns", "end_ns", "span_id"})
_SPARSE = {
    "outcome": OUTCOME_OK,
    "call_id": None,
    "error_type": None,
    "thread": None,
    "executor_workers": None,
    "pool": "",
    "cpu_ns": None,
}
_DENSE = tuple(name for name in _FIELDS if name not in _SPARSE)
_fields_of = attrgetter(*_FIELDS)  # a ToolCall's fields, in its order

# Records made per step while iterating (each step's columns sliced once).
_CHUNK = 4096

# Rows kept in ``pending`` before they are moved into the columns: a few
# tens of kB of tuples (``flush``).
PENDING_ROWS = 512

# Where each column is kept (a column is read through a property that
# moves the pending rows in first).
_SLOTS = tuple("_" + name for name in _FIELDS)


class CallTable(Sequence[ToolCall]):
    """The tool calls, row i being call i: a column per ``ToolCall`` field
    (named as the field), appended to by ``append``. A column of
    ``outcome``, ``call_id``, ``error_type``, ``thread``,
    ``executor_workers``, ``pool`` or ``cpu_ns`` is None while every call
    has its usual value (``ok``, None, or "" for the pool): ``column`` reads
    any column. Rows added with ``add_row`` or ``pending.append`` wait in
    ``pending`` (at most ``PENDING_ROWS`` of them where the adder calls
    ``flush`` when it holds that many): reading a column, the length or a
    record moves them in first."""

    __slots__ = (*_SLOTS, "_records", "pending")

    tool: list[str]
    executor: list[str]
    submit_ns: array
    start_ns: array
    end_ns: array
    outcome: Optional[list[str]]
    call_id: Optional[list[Optional[str]]]
    trace_id: list[int]
    span_id: array
    error_type: Optional[list[Optional[str]]]
    thread: Optional[list[Optional[str]]]
    executor_workers: Optional[list[Optional[int]]]
    pool: Optional[list[str]]
    cpu_ns: Optional[list[Optional[int]]]
    _tool: list[str]  # (the tool column where it is kept: the length of the columns)

    def __init__(self) -> None:
        for name in _DENSE:
            setattr(self, "_" + name, array("Q") if name in _WORDS else [])
        for name in _SPARSE:
            setattr(self, "_" + name, None)
        self._records: Optional[list[ToolCall]] = None
        # rows not yet in the columns: tuples of ToolCall's fields, in its order
        self.pending: list[tuple] = []

    @classmethod
    def of(cls, calls: Iterable[ToolCall]) -> CallTable:
        """A table of these records, kept (``keep``)."""
        table = cls()
        table.keep()
        for call in calls:
            table.append(call)
        return table

    def append(self, call: ToolCall) -> None:
        """Add a call at the end (its fields; the record itself only when kept)."""
        self.add(*_fields_of(call), record=call)

    def add(
        self,
        tool: str,
        executor: str,
        submit_ns: int,
        start_ns: int,
        end_ns: int,
        outcome: str,
        call_id: Optional[str],
        trace_id: int,
        span_id: int,
        error_type: Optional[str],
        thread: Optional[str],
        executor_workers: Optional[int],
        pool: str,
        cpu_ns: Optional[int],
        *,
        record: Optional[ToolCall] = None,
    ) -> None:
        """Add a call at the end from its fields (``ToolCall``'s, in its
        order): no record is made unless the table keeps them (then
        ``record``, where the caller has it)."""
        row = (
            tool,
            executor,
            submit_ns,
            start_ns,
            end_ns,
            outcome,
            call_id,
            trace_id,
            span_id,
            error_type,
            thread,
            executor_workers,
            pool,
            cpu_ns,
        )
        if self._records is None:
            self.add_row(row)
            return
        self.flush()
        self._records.append(ToolCall(*row) if record is None else record)
        self._extend([row])

    def add_row(self, row: tuple) -> None:
        """Add a call at the end: a tuple of its fields, in ``ToolCall``'s order."""
        pending = self.pending
        pending.append(row)
        if len(pending) >= PENDING_ROWS:
            self.flush()

    def flush(self) -> None:
        """Move the pending rows into the columns (and, where the table keeps its records, make theirs)."""
        rows = self.pending
        if not rows:
            return
        if self._records is not None:
            self._records.extend([ToolCall(*row) for row in rows])
        self._extend(rows)
        rows.clear()  # (in place: an adder may hold its append)

    def _extend(self, rows: list[tuple]) -> None:
        """The rows' fields at the end of the columns; a sparse column made at its first unusual value."""
        count = len(self._tool)
        for slot, name, values in zip(_SLOTS, _FIELDS, zip(*rows)):
            column = getattr(self, slot)
            if column is not None:
                column.extend(values)
                continue
            usual = _SPARSE[name]
            if values.count(usual) != len(values):  # (as != does: the usual values are None, "ok" and "")
                setattr(self, slot, [usual] * count + list(values))

    def column(self, name: str) -> Sequence:
        """A field's column (one still None: its usual value in every row)."""
        column = getattr(self, name)
        return _Same(_SPARSE[name], len(self)) if column is None else column

    def __len__(self) -> int:
        return len(self._tool) + len(self.pending)

    @overload
    def __getitem__(self, row: int) -> ToolCall: ...

    @overload
    def __getitem__(self, row: slice) -> list[ToolCall]: ...

    def __getitem__(self, row):
        if self.pending:
            self.flush()
        if self._records is not None:
            return self._records[row]
        if isinstance(row, slice):
            return list(islice(self, *row.indices(len(self))))
        return ToolCall(*(self.column(name)[row] for name in _FIELDS))

    def __iter__(self) -> Iterator[ToolCall]:
        if self.pending:
            self.flush()
        if self._records is not None:
            yield from self._records
            return
        columns = [getattr(self, name) for name in _FIELDS]
        for first in range(0, len(self), _CHUNK):
            yield from map(ToolCall, *(_sliced(column, name, first) for column, name in zip(columns, _FIELDS)))

    def records(self, rows: Sequence[int]) -> list[ToolCall]:
        """The records of these rows, in this order."""
        if self.pending:
            self.flush()
        if self._records is not None:
            return [self._records[row] for row in rows]
        if len(rows) < 2:
            return [self[row] for row in rows]
        pick = itemgetter(*rows)
        columns = [getattr(self, name) for name in _FIELDS]
        return list(
            map(
                ToolCall,
                *(repeat(_SPARSE[name]) if column is None else pick(column) for column, name in zip(columns, _FIELDS)),
            )
        )

    def keep(self) -> list[ToolCall]:
        """Make every call's record once and keep it: from now on the table
        hands out these records (the same object for a call every time)."""
        if self._records is None:
            self._records = list(self)
        elif self.pending:
            self.flush()
        return self._records

    def select(self, rows: Sequence[int]) -> None:
        """Keep only these rows, in this order (one column at a time: the
        table's memory grows by one column's meanwhile, not by its copy)."""
        self.flush()
        pick = itemgetter(*rows) if len(rows) > 1 else lambda column: tuple(column[row] for row in rows)
        for slot, name in zip(_SLOTS, _FIELDS):
            column = getattr(self, slot)
            if column is not None:
                picked = pick(column)
                setattr(self, slot, array("Q", picked) if name in _WORDS else list(picked))
                del picked
        if self._records is not None:
            self._records = [self._records[row] for row in rows]


def _column_of(slot: str) -> property:
    """A column, read where it is kept (``_SLOTS``) once the pending rows are in."""
    kept = attrgetter(slot)

    def read(table: CallTable) -> Any:
        if table.pending:
            table.flush()
        return kept(table)

    return property(read, doc=f"the {slot[1:]} column")


for _name, _slot in zip(_FIELDS, _SLOTS):
    setattr(CallTable, _name, _column_of(_slot))


def _sliced(column: Optional[Sequence], name: str, first: int) -> Iterable:
    """Rows ``first`` on of a column, at most a chunk of them (map stops at its shortest argument)."""
    return repeat(_SPARSE[name]) if column is None else column[first : first + _CHUNK]


class _Same(Sequence[object]):
    """``count`` times one value, without a list of them."""

    __slots__ = ("_value", "_count")

    def __init__(self, value: object, count: int) -> None:
        self._value, self._count = value, count

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[object]:
        return repeat(self._value, self._count)

    @overload
    def __getitem__(self, row: int) -> object: ...

    @overload
    def __getitem__(self, row: slice) -> list[object]: ...

    def __getitem__(self, row):
        if isinstance(row, slice):
            return [self._value] * len(range(*row.indices(self._count)))
        if not -self._count <= row < self._count:
            raise IndexError("row out of range")
        return self._value
