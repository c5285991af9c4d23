"""Tests of the cloud adapter and the stub cloud (a package so its conftest does not shadow others)."""
