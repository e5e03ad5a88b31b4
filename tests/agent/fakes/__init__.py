"""Stand-ins for the hardware a test machine lacks: NVML and sysfs."""
