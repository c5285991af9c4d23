"""Scheduling: the pure choice of where containers run (instance-type catalogue and selection)."""
