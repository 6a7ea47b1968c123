"""The layer IR: the graph, its builder, FLOP counts and its file format."""
