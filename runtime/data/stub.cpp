// Placeholder until the synthetic generator and calibration format land (issue 3).
