"""Who reads which Events, and the filters only the apps above audit can apply.

Operators (and superusers) read the whole log. Every other signed-in user reads what
they did and what was done to their account (``audit.filters.own_events``): a failed
sign-in names what was typed and where from, and the log holds every operator's acts,
which are not every reader's business. ``llmgw_ctl`` runs at the control plane's shell,
whose user holds the database already: it reads everything.
"""

from __future__ import annotations

from django.db.models import QuerySet

from audit.filters import EventFilter, own_events
from audit.models import Event
from catalog.permissions import is_operator


class EventFilterRefused(ValueError):
    """A filter that cannot be applied here, in words a reader can act on."""


def readable_events(user) -> QuerySet[Event]:
    """The Events ``user`` may read (none for a user not signed in)."""
    if not user or not user.is_authenticated:
        return Event.objects.none()
    if is_operator(user):
        return Event.objects.all()
    return Event.objects.filter(own_events(user))


def events_of_team(events: QuerySet[Event], team: str) -> QuerySet[Event]:
    """``events`` narrowed to ``team``'s: where "by team" plugs in (issue 43) once teams
    exist. Events name an actor and a subject, not a team, so the rule is the teams
    app's to give, e.g. an actor who is a member, or a subject that is one of the team's
    keys or models; ``readable_events`` then lets a team's lead read their team's."""
    raise EventFilterRefused(
        f"team {team!r}: llmgw has no teams yet, so events cannot be narrowed to one"
    )


def asked_events(events: QuerySet[Event], asked: EventFilter) -> QuerySet[Event]:
    """``events`` narrowed to what ``asked`` asks (paging aside)."""
    events = events.filter(asked.where())
    if asked.team:
        events = events_of_team(events, asked.team)
    return events
