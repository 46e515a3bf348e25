"""Sleep mode: a worker's memory freed by tag (weights, KV cache) and given back, through tagged pools."""
