"""A password hasher for the tests' own users: Django's PBKDF2 at one round.

PBKDF2's million rounds cost about half a second a password on two cores, paid for every
user a test makes. The hashes it writes name the same algorithm and their own round count,
so a control plane a test starts (with Django's hashers) checks them as they are.
"""

from __future__ import annotations

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class OneRoundPBKDF2(PBKDF2PasswordHasher):
    iterations = 1
