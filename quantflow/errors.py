"""Errors raised by the pipeline; each carries a message meant for the user."""


class QuantflowError(Exception):
    """Base class of every error the pipeline reports to the user."""


class ConfigError(QuantflowError):
    """The configuration file is missing, malformed or holds invalid values."""


class DataError(QuantflowError):
    """Calibration or evaluation images are missing, unreadable or of the wrong size."""


class UnsupportedNetworkError(QuantflowError):
    """The network holds a layer or topology the quantizer / integer emulator cannot handle."""


class AippMismatchError(QuantflowError):
    """The AIPP configuration does not reproduce the training preprocessing."""


class AtcError(QuantflowError):
    """atc failed; the message carries atc's own error text."""


class AccuracyGateError(QuantflowError):
    """The INT8 model lost more accuracy than the configured threshold allows."""
