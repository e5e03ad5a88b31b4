"""The pages operators live in: ``urls``, ``views`` (cluster, node, model, logs, weights and
the metrics endpoint), ``action_views`` (the buttons: each a POST that calls a verb),
``fragments`` (what each live page shows and which changes touch which fragment),
``consumers`` (the pages' websockets, pushing those fragments), ``mirror`` (one model's
weights across the fleet) and ``sign_in`` (sign-in that throttles guessing). The template
tags stay in ``fleet.templatetags``, where Django looks for them."""
