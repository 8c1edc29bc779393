"""The ground floor: artifact files written whole or not at all (``atomic``) and content digests (``digest``).
Every layer may import it; it imports nothing of quantflow."""
