"""The tool calls the reader keeps: columns, with ``ToolCall`` records made on demand.

At a million spans 500k ``ToolCall`` records take about 145 MB (144 bytes
each and about 140 bytes of ints: a Python int is 32-40 bytes); as
columns the same calls take about 60 MB: the times and span ids as
unsigned 64-bit ints in ``array(U64)`` (8 bytes each; the reader keeps
every time and id in [0, 2**64)), the 128-bit trace ids as two such
halves (``TraceIds``: 16 bytes a call where a list of a trace per call
took 56), and the other fields as lists of the
reader's shared objects (8 bytes a reference). The statistics read the
columns (``report.columns``), the turns read them by row; whatever else iterates or indexes the table
gets a ``ToolCall`` made for it, which lives only while it is used.
The HTML and Perfetto outputs, which map the attribution's shares back to
their calls by identity, ``keep`` the records instead: then the table
hands out the same record for a call every time.

No numpy at import: the blame service's reader builds a table too
(``agent-otel gpu-exporter`` starts without numpy).
"""

from __future__ import annotations

from array import array
from itertools import islice, repeat
from operator import attrgetter, itemgetter, lshift, or_
from typing import Callable, Iterable, Iterator, Optional, Sequence, overload

from agent_otel.records import ToolCall
from agent_otel.semconv import OUTCOME_OK

# The typecode of every array of unsigned 64-bit ints the reader fills:
# "L" where a C unsigned long has 64 bits (Linux, macOS), whose append
# converts an int in a few steps; "Q" (unsigned long long, converted
# through a byte array: 4 % of the read's instructions) elsewhere.
U64 = "L" if array("L").itemsize == 8 else "Q"

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


class CallTable(Sequence[ToolCall]):
    """The tool calls, row i being call i: a column per ``ToolCall`` field
    (named as the field), appended to by ``append``. A column of
    ``outcome``, ``call_id``, ``error_type``, ``thread``,
    ``executor_workers``, ``pool`` or ``cpu_ns`` is None while every call
    has its usual value (``ok``, None, or "" for the pool): ``column`` reads
    any column."""

    __slots__ = (*_FIELDS, "_records")

    tool: list[str]
    executor: list[str]
    submit_ns: array
    start_ns: array
    end_ns: array
    outcome: Optional[list[str]]
    call_id: Optional[list[Optional[str]]]
    trace_id: TraceIds
    span_id: array
    error_type: Optional[list[Optional[str]]]
    thread: Optional[list[Optional[str]]]
    executor_workers: Optional[list[Optional[int]]]
    pool: Optional[list[str]]
    cpu_ns: Optional[list[Optional[int]]]

    def __init__(self) -> None:
        for name in _DENSE:
            setattr(self, name, array(U64) if name in _WORDS else [])
        self.trace_id = TraceIds()
        for name in _SPARSE:
            setattr(self, name, None)
        self._records: Optional[list[ToolCall]] = None

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
        if self._records is not None:
            if record is None:
                record = ToolCall(
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
            self._records.append(record)
        # (the sparse columns one by one, unrolled: this runs once a call)
        rows = len(self.tool)
        self.tool.append(tool)
        self.executor.append(executor)
        self.submit_ns.append(submit_ns)
        self.start_ns.append(start_ns)
        self.end_ns.append(end_ns)
        trace_ids = self.trace_id
        trace_ids.high.append(trace_id >> 64)
        trace_ids.low.append(trace_id & _LOW_64)
        self.span_id.append(span_id)
        column: Optional[list] = self.outcome
        if column is not None:
            column.append(outcome)
        elif outcome != OUTCOME_OK:
            self._fill("outcome", outcome, rows)
        column = self.call_id
        if column is not None:
            column.append(call_id)
        elif call_id is not None:
            self._fill("call_id", call_id, rows)
        column = self.error_type
        if column is not None:
            column.append(error_type)
        elif error_type is not None:
            self._fill("error_type", error_type, rows)
        column = self.thread
        if column is not None:
            column.append(thread)
        elif thread is not None:
            self._fill("thread", thread, rows)
        column = self.executor_workers
        if column is not None:
            column.append(executor_workers)
        elif executor_workers is not None:
            self._fill("executor_workers", executor_workers, rows)
        column = self.pool
        if column is not None:
            column.append(pool)
        elif pool != "":
            self._fill("pool", pool, rows)
        column = self.cpu_ns
        if column is not None:
            column.append(cpu_ns)
        elif cpu_ns is not None:
            self._fill("cpu_ns", cpu_ns, rows)

    def _fill(self, name: str, value: object, rows: int) -> None:
        """The first unusual value of a sparse column: the column made, with its usual value before it."""
        setattr(self, name, [_SPARSE[name]] * rows + [value])

    def column(self, name: str) -> Sequence:
        """A field's column (one still None: its usual value in every row)."""
        column = getattr(self, name)
        return _Same(_SPARSE[name], len(self)) if column is None else column

    def __len__(self) -> int:
        return len(self.tool)

    @overload
    def __getitem__(self, row: int) -> ToolCall: ...

    @overload
    def __getitem__(self, row: slice) -> list[ToolCall]: ...

    def __getitem__(self, row):
        if self._records is not None:
            return self._records[row]
        if isinstance(row, slice):
            return list(islice(self, *row.indices(len(self))))
        return ToolCall(*(self.column(name)[row] for name in _FIELDS))

    def __iter__(self) -> Iterator[ToolCall]:
        if self._records is not None:
            yield from self._records
            return
        columns = [getattr(self, name) for name in _FIELDS]
        for first in range(0, len(self), _CHUNK):
            yield from map(ToolCall, *(_sliced(column, name, first) for column, name in zip(columns, _FIELDS)))

    def records(self, rows: Sequence[int]) -> list[ToolCall]:
        """The records of these rows, in this order."""
        if self._records is not None:
            return [self._records[row] for row in rows]
        if len(rows) < 2:
            return [self[row] for row in rows]
        pick = itemgetter(*rows)
        columns = [getattr(self, name) for name in _FIELDS]
        return list(
            map(
                ToolCall,
                *(
                    repeat(_SPARSE[name])
                    if column is None
                    else column.take(rows, pick)
                    if type(column) is TraceIds
                    else pick(column)
                    for column, name in zip(columns, _FIELDS)
                ),
            )
        )

    def keep(self) -> list[ToolCall]:
        """Make every call's record once and keep it: from now on the table
        hands out these records (the same object for a call every time)."""
        if self._records is None:
            records = list(self)
            # one int per trace among the records, as the reader shared them
            # (the column keeps none): the recent traces, a trace's calls being near
            shared: dict[int, int] = {}
            for record in records:
                trace_id = record.trace_id
                kept = shared.setdefault(trace_id, trace_id)
                if kept is not trace_id:
                    record.trace_id = kept
                elif len(shared) > _SHARED:
                    shared = {trace_id: trace_id}
            self._records = records
        return self._records

    def select(self, rows: Sequence[int]) -> None:
        """Keep only these rows, in this order (one column at a time: the
        table's memory grows by one column's meanwhile, not by its copy)."""
        pick = itemgetter(*rows) if len(rows) > 1 else lambda column: tuple(column[row] for row in rows)
        # (the 64-bit columns of a large table picked in numpy, as bytes: through
        # Python ints, 0.1 s a column at 870k rows against 3 ms)
        words = _words_picker(rows) if len(rows) >= _WORDS_IN_NUMPY else pick
        for name in _FIELDS:
            column = getattr(self, name)
            if type(column) is TraceIds:
                self.trace_id = column.take(rows, words)
            elif column is not None:
                picked = words(column) if name in _WORDS else pick(column)
                setattr(self, name, array(U64, picked) if name in _WORDS else list(picked))
                del picked
        if self._records is not None:
            self._records = [self._records[row] for row in rows]


class TraceIds(Sequence[int]):
    """128-bit trace ids as two ``array(U64)`` columns, ``high`` and ``low``
    (their top and bottom 64 bits: 16 bytes an id where a list of ints
    takes 56 for each distinct one); indexing and iterating give the ids
    as ints, a slice gives a ``TraceIds``. Readers in numpy read the halves
    (``np.frombuffer(ids.high, np.uint64)``)."""

    __slots__ = ("high", "low")

    def __init__(self, high: Optional[array] = None, low: Optional[array] = None) -> None:
        self.high = array(U64) if high is None else high
        self.low = array(U64) if low is None else low

    def append(self, trace_id: int) -> None:
        self.high.append(trace_id >> 64)
        self.low.append(trace_id & _LOW_64)

    def __len__(self) -> int:
        return len(self.low)

    @overload
    def __getitem__(self, row: int) -> int: ...

    @overload
    def __getitem__(self, row: slice) -> TraceIds: ...

    def __getitem__(self, row):
        if isinstance(row, slice):
            return TraceIds(self.high[row], self.low[row])
        return self.high[row] << 64 | self.low[row]

    def __iter__(self) -> Iterator[int]:
        return map(or_, map(lshift, self.high, repeat(64)), self.low)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TraceIds):
            return self.high == other.high and self.low == other.low
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def take(self, rows: Sequence[int], pick: Optional[Callable[[array], Sequence[int]]] = None) -> TraceIds:
        """These rows, in this order (``pick``: ``itemgetter(*rows)``, where the caller has it)."""
        if len(rows) < 2:
            return TraceIds(array(U64, [self.high[row] for row in rows]), array(U64, [self.low[row] for row in rows]))
        if pick is None:
            pick = itemgetter(*rows)
        return TraceIds(array(U64, pick(self.high)), array(U64, pick(self.low)))


_LOW_64 = (1 << 64) - 1
# A table selected with this many rows or more moves its 64-bit columns in numpy.
_WORDS_IN_NUMPY = 1 << 12


def _words_picker(rows: Sequence[int]) -> Callable[[array], bytes]:
    """What picks ``rows`` of an ``array(U64)``, in numpy: their bytes, for ``array(U64, ...)``."""
    import numpy as np  # (not at import: the blame service's reader builds tables too)

    taken = np.asarray(rows, np.intp)

    def words(column: array) -> bytes:
        return np.frombuffer(column, np.uint64)[taken].tobytes()

    return words


# How many recent trace ids ``keep`` shares one int of (as the reader's ``TRACE_IDS``).
_SHARED = 1 << 14


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
