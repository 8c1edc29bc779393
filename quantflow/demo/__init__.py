"""The shipped demo: a small CNN trained on scikit-learn's bundled handwritten digits.

The 8x8 digit scans (UCI optical digits, bundled with scikit-learn, no download) are
upscaled to 32x32 and drawn with a per-image foreground/background colour, so that the
three input channels (and hence channel order and per-channel normalization) matter.
"""
