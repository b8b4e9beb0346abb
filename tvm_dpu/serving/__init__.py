"""The serving front: the VART-style runner (execute_async / wait) over artifacts and xmodels, the throughput
benchmark, and the checks on arrays users hand in (inputs, calibration data)."""
