"""The configs: ``base`` (every field and its default), ``variants`` (named variants such as the
paper's ablations and ``smoke``) and one module per dataset, each giving ``get_config(variant)``."""
