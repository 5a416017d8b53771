"""Consumer groups: offset stores, queue locks, membership, a query's session in its group,
progress resets, queue allocation strategies and the state files they live in."""
