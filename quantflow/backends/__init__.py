"""Back-ends: what the device needs (MindIR/AIR export, AIPP config, atc conversion)."""
