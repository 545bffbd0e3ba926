"""A worked load test: a local HTTP target (``target``), a task that calls it
(``app``), and the script that drives it in steps to its knee (``example``)."""
