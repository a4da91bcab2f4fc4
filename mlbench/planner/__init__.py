"""`mlbench plan`: device facts, a per-GPU memory plan, an explicit step-time model calibrated on published
runs, MLPerf time-to-train from the RCP data, and the search for the best layout."""
