"""Errors that reach the user as one line (the CLI prints ``specdiff: error: <message>``)."""


class SpecdiffError(Exception):
    """Base of every error specdiff reports to the user as one clear line."""


class TraceError(SpecdiffError):
    """A trace store that cannot be opened or read: corrupt, foreign, or another format version."""
