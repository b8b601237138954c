"""Scaling-law experiments: isoFLOP sweeps, fitted laws and registered forecasts (see docs/scaling.md)."""
