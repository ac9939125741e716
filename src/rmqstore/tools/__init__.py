"""Tools over a store: the `rmqstore` command line, the golden dump format, benchmarks and the demo."""
