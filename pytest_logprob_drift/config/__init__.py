"""Configuration: strict loading of experiment configs (``loader``) and the versioned numerical
contract that fixes the threshold (``contract``). Imports only the records; no torch."""
