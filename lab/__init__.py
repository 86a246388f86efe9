"""The lab: what the studies need beyond the core (probes, the study runner and its statistics, pairs, the context
sweep, the base bound, curves). It imports the core; the core never imports it."""
