"""Reports: analyses (DataFrames), figures (PNG) and the HTML page, in that order."""
