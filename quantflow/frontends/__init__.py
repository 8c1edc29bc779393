"""Front-ends: read a trained model into quantflow's graph IR."""
