from django.contrib import admin

from fleet.models import Node, Replica, Shard
from fleet.sign_in import AdminSignInForm

# The admin's sign-in shares the pages' throttling: the same password, the same guesser.
admin.site.login_form = AdminSignInForm


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["id", "state", "address", "last_heartbeat", "draining"]
    list_filter = ["state", "draining"]
    # State moves through fleet.transitions, never by hand-editing a form.
    readonly_fields = ["state", "state_changed_at", "last_heartbeat", "registered_at"]


class ShardInline(admin.TabularInline):
    model = Shard
    extra = 0
    readonly_fields = ["state", "node", "rank", "gpus", "port", "pid", "reason"]


@admin.register(Replica)
class ReplicaAdmin(admin.ModelAdmin):
    list_display = ["__str__", "state", "fingerprint", "created_at"]
    list_filter = ["state", "model_name"]
    readonly_fields = ["state", "state_changed_at", "fingerprint"]
    inlines = [ShardInline]


@admin.register(Shard)
class ShardAdmin(admin.ModelAdmin):
    list_display = ["id", "replica", "rank", "node", "state"]
    list_filter = ["state"]
    readonly_fields = ["state", "state_changed_at"]
