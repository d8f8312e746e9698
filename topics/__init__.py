"""The wire contract: topic tree, payload models, AsyncAPI document. Pure (no I/O)."""
