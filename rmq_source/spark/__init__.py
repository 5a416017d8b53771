"""The Spark side: the data source ``format("rmq")``, its options, the batch and streaming readers,
positions, task planning and the offsets JSON. It reaches messages and group state only through
:class:`rmq_source.backend.Backend`."""
