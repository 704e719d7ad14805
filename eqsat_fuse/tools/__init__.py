"""Research and reporting tools built on the compiler: reports, explain, compare, calibrate, export."""
