"""The project's own errors. Every entry point turns these into a one-line message and a non-zero exit."""

from __future__ import annotations


class KernelmapError(Exception):
    """A failure the user can act on; printed as one line, never as a traceback."""

    exit_code = 2


class ParseError(KernelmapError):
    """A trace or log could not be read. Names the file and, where known, the line or record."""

    def __init__(self, path: str, cause: str, line: int | None = None, record: int | None = None):
        self.path = str(path)
        self.cause = cause
        self.line = line
        self.record = record
        where = self.path
        if line is not None:
            where += f":{line}"
        elif record is not None:
            where += f" (record {record})"
        super().__init__(f"{where}: {cause}")


class SchemaError(KernelmapError):
    """Records that do not satisfy docs/SCHEMA.md (wrong version, missing columns, bad values)."""


class MissingToolError(KernelmapError):
    """A framework, device or profiler is not available; the message names the fix."""

    exit_code = 3
