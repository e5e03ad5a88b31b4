"""Node.engines was {engine: {version, path, status}}; it is now one entry per engine
version, each naming its engine, so a node can hold two versions and say how each stands."""

from django.db import migrations


def to_list(apps, schema_editor):
    Node = apps.get_model("fleet", "Node")
    for node in Node.objects.exclude(engines=None):
        if isinstance(node.engines, dict):
            node.engines = [
                {
                    "engine": name,
                    "version": info.get("version", ""),
                    "path": info.get("path", ""),
                    "status": "installed",
                }
                for name, info in node.engines.items()
                if info.get("status", "installed") == "installed"
            ]
            node.save(update_fields=["engines"])


def to_dict(apps, schema_editor):
    Node = apps.get_model("fleet", "Node")
    for node in Node.objects.exclude(engines=None):
        if isinstance(node.engines, list):
            node.engines = {
                entry["engine"]: {
                    "version": entry.get("version", ""),
                    "path": entry.get("path", ""),
                }
                for entry in node.engines
                if entry.get("status") == "installed"
            }
            node.save(update_fields=["engines"])


class Migration(migrations.Migration):
    dependencies = [("fleet", "0007_node_usage_reported_at")]

    operations = [migrations.RunPython(to_list, to_dict)]
