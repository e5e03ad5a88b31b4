"""Deploying from the browser: the new-model page, a profile's edit page and deleting a model.

Operators only. "Plan" shows what the change would do now (``fleet.planning.deploy``) and
changes nothing; deploying, or saving an edit that replaces running replicas, is done only
for the entry that was planned (its digest comes back with the form), so what is applied
is what the operator saw. Every change goes through ``catalog.actions.entries.apply_model``, whose
Event names the operator; deleting a model is a button (``action_views.delete_model``).
"""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from catalog.actions.entries import apply_model
from catalog.models import Profile
from catalog.schema import CatalogError
from fleet.pages.action_views import operator_page
from fleet.pages.deploy_form import EditProfileForm, NewModelForm
from fleet.planning.deploy import ModelPlan, plan_model

# What a deploy whose form changed after its plan is told.
REPLANNED = "The form changed after it was planned: check this plan, then deploy it."
# What saving an edit that replaces running replicas is told first.
RESTARTS = (
    "These settings change what the engine runs, so a rolling restart replaces the running "
    "replicas: check the plan, then save."
)


@operator_page
def new_model(request: HttpRequest) -> HttpResponse:
    form = NewModelForm(request.POST or None, initial={"engine": "llama.cpp"})
    plan: ModelPlan | None = None
    notice = ""
    if request.method == "POST" and (entry := form.entry()) is not None:
        try:
            plan = plan_model(entry, creating=True, actor=request.user)
            if request.POST.get("action") == "deploy":
                if request.POST.get("planned") == plan.digest:
                    apply_model(entry, creating=True, actor=request.user)
                    return redirect("model", entry.name)
                notice = REPLANNED
        except CatalogError as exc:
            form.add_problems(exc.problems)
            plan = None
    context = {"form": form, "plan": plan, "notice": notice}
    return render(request, "fleet/deploy.html", context)


@operator_page
def edit_profile(request: HttpRequest, profile_id: int) -> HttpResponse:
    profile = Profile.objects.select_related("model").filter(id=profile_id).first()
    if profile is None:
        raise Http404(f"no profile {profile_id}")
    form = EditProfileForm(profile, request.POST or None)
    plan: ModelPlan | None = None
    notice = ""
    if request.method == "POST" and (entry := form.entry()) is not None:
        try:
            plan = plan_model(entry, creating=False, actor=request.user)
            saving = request.POST.get("action") == "save"
            if not plan.changes:
                notice = "Nothing to change: the profile already says this."
            elif saving and (not plan.restarts or request.POST.get("planned") == plan.digest):
                # A change that replaces no replica needs no plan first.
                apply_model(entry, creating=False, actor=request.user)
                return redirect("model", profile.model.name)
            elif saving:
                notice = RESTARTS
        except CatalogError as exc:
            form.add_problems(exc.problems)
            plan = None
    context = {"form": form, "plan": plan, "notice": notice, "profile": profile}
    return render(request, "fleet/profile_edit.html", context)
