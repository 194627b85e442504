"""watchd's configuration, one module per part; import a name from the module that owns it.

``fields`` (the building blocks and ConfigError), ``watching``, ``alerting``,
``sweep``, ``telemetry``, ``process`` (the models per subsystem), ``model`` (the
whole Config), ``loading`` (YAML → Config), ``secrets`` (reading references) and
``schema`` (the JSON Schema generated from the models: ``python -m watchd.config.schema``).
"""
