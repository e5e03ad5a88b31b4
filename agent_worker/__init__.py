"""The node agent: discovery, heartbeats, engines and weights on one node. It never imports
Django and speaks to the control plane only through ``protocol``."""
