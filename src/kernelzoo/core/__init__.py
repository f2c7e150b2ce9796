"""The retrieval core: the associative-retrieval task, the model and its memories (sum, delta,
fwm), the literal reference forward, and the diagnostics of a trained memory. It knows nothing
of Hydra, stores or wandb."""
