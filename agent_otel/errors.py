"""The toolkit's own exceptions: each names what was wrong and where."""


class AgentOtelError(Exception):
    """Base class; the CLI prints these as one line, without a traceback."""


class ConfigError(AgentOtelError, ValueError):
    """A setting (argument or environment variable) has an invalid value."""

    def __init__(self, setting: str, value: object, expected: str):
        self.setting = setting
        self.value = value
        super().__init__(f"invalid value {value!r} for {setting}: expected {expected}")


class InputError(AgentOtelError):
    """An input file is malformed; the message names the file and line."""

    def __init__(self, path: str, line: int | None, message: str):
        self.path = path
        self.line = line
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")
