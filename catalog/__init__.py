"""What should run: models, profiles, engines, pools, fabrics and API keys, and the verbs
that change them (``catalog.actions``). Stands on audit, core and protocol; never imports
fleet."""
