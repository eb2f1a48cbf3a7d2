"""The base of every error dlscale raises on purpose.

Each one carries a message that names the bad key, file or device and says what to do,
so the CLI prints it alone, without a traceback.
"""


class DlscaleError(Exception):
    """A problem the user can fix: a bad config, missing data, an unavailable device..."""
