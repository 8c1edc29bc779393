"""Image data: folders of images and their labels, decoding, the training preprocessing (``images``), and the
seeded, stratified calibration sample (``sampling``)."""
