"""What llmgw keeps of people beside Django's users: the provider accounts they sign in
through (``identities``). A room under ``fleet.models``, which imports its models so
Django finds them; it imports nothing of the fleet's."""
