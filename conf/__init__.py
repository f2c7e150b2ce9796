"""kernelzoo's Hydra config groups, shipped as the package kernelzoo.conf (pyproject.toml maps it
to this directory) so that an installed kernelzoo finds them; ``kernelzoo.config.CONF``."""
