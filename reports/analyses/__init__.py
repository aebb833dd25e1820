"""The report's analyses, one module per topic; ``reports.analysis`` is their one import point."""
