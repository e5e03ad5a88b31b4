"""The admin shows the fleet's rows and changes nothing by hand: a node is drained, returned
to service or put in a pool by an admin action, which calls the same verb as the pages and
``llmgw_ctl`` (its Event names the user; a drain tells the agent)."""

from __future__ import annotations

from collections.abc import Callable

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.db.models import QuerySet
from django.http import HttpRequest

from catalog.models import Pool
from catalog.permissions import is_operator
from fleet.actions.nodes import NodeRefused, drain_node, set_node_pool, undrain_node
from fleet.models import Node, Replica, Shard
from fleet.pages.sign_in import AdminSignInForm

# The admin's sign-in shares the pages' throttling: the same password, the same guesser.
admin.site.login_form = AdminSignInForm


class ReadOnly:
    """Rows the admin shows but never adds, edits or deletes: state moves through verbs."""

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


def _pool_choices() -> list[tuple[str, str]]:
    names = Pool.objects.order_by("name").values_list("name", flat=True)
    return [("", "(no pool)"), *((name, name) for name in names)]


class NodeActionForm(ActionForm):
    # Read by "put in the pool below"; the other actions ignore it.
    pool = forms.ChoiceField(choices=_pool_choices, required=False, label="pool")


@admin.register(Node)
class NodeAdmin(ReadOnly, admin.ModelAdmin):
    list_display = ["id", "state", "address", "pool", "last_heartbeat", "draining"]
    list_filter = ["state", "draining", "pool"]
    action_form = NodeActionForm
    actions = ["drain", "undrain", "put_in_pool"]

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return is_operator(request.user)

    @admin.action(description="Drain: place nothing more there, move replicas off",
                  permissions=["operate"])  # fmt: skip
    def drain(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        self._each(request, queryset, lambda node: drain_node(node.id, actor=request.user),
                   "draining", "was already draining")  # fmt: skip

    @admin.action(description="Return to service", permissions=["operate"])
    def undrain(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        self._each(request, queryset, lambda node: undrain_node(node.id, actor=request.user),
                   "back in service", "was not draining")  # fmt: skip

    @admin.action(description="Put in the pool below", permissions=["operate"])
    def put_in_pool(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        pool = request.POST.get("pool", "")
        where = f"in pool {pool}" if pool else "in no pool"
        try:
            self._each(request, queryset,
                       lambda node: set_node_pool(node.id, pool, actor=request.user),
                       where, f"was already {where}")  # fmt: skip
        except NodeRefused as exc:
            self.message_user(request, str(exc), messages.ERROR)

    def _each(
        self, request: HttpRequest, queryset: QuerySet[Node], verb: Callable[[Node], bool],
        done: str, unchanged: str,
    ) -> None:  # fmt: skip
        changed: list[str] = []
        same: list[str] = []
        for node in queryset:
            (changed if verb(node) else same).append(node.id)
        said = [f"{', '.join(changed)} {done}"] if changed else []
        said += [f"{', '.join(same)} {unchanged}"] if same else []
        self.message_user(request, "; ".join(said) or "no node selected")


class ShardInline(ReadOnly, admin.TabularInline):
    model = Shard
    extra = 0


@admin.register(Replica)
class ReplicaAdmin(ReadOnly, admin.ModelAdmin):
    list_display = ["__str__", "state", "fingerprint", "created_at"]
    list_filter = ["state", "model_name"]
    inlines = [ShardInline]


@admin.register(Shard)
class ShardAdmin(ReadOnly, admin.ModelAdmin):
    list_display = ["id", "replica", "rank", "node", "state"]
    list_filter = ["state"]
