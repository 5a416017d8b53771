"""Broker store folders: the C core's wrapper (:mod:`.native`), the reader (:class:`.reader.Store`),
the CommitLog record codec, bodies, index and config files, the writer, and the store backend."""
