// Placeholder until the index lands (issue 3).
