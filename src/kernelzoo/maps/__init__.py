"""Feature maps phi: the base class and registry (base.py), the built-in maps (base.py: the
elementwise ones; dpfp.py, random_features.py, zoo.py) and catalog.py, which imports them all.
A map declares its own d_dot; nothing here knows of Hydra, stores or wandb."""
