"""The plan as data: the record, its file format, its summary table and its PartitionSpecs."""
