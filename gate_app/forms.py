"""The forms of the /optimize/ page: what to gate, walk or optimize, checked by gate_app.submit (the same
checks as POST /api/jobs/), whose message is shown against the form when it refuses; and the
/upload/ page's form, whose files gate_app.uploads checks."""

from __future__ import annotations

from typing import Any

from django import forms

from gate_app import submit, uploads
from gate_app.queue import QueueError

MODE_CHOICES = [("compile", "compile only (no GPU; a dry run, unverified)"),
                ("replay", "replay recorded verdicts (no GPU)"), ("gpu", "GPU (a GPU worker runs it)")]
assert {value for value, _ in MODE_CHOICES} == set(submit.GATE_MODES)


def _rewriters() -> list[tuple[str, str]]:
    choices = [("rules", "rules (the transform catalog)")]
    if submit.llm_configured():
        choices.append(("llm", "LLM (the configured model)"))
    return choices


class _JobForm(forms.Form):
    """A kind's form (gate_app.kinds names it), made with the kind's name as its prefix."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["kernel"].choices = [(name, name) for name in submit.kernel_choices()]
        self.fields["problem"].choices = [("", "the kernel's own problem")] + [
            (name, name) for name in submit.problem_choices()]
        if "rewriter" in self.fields:
            self.fields["rewriter"].choices = _rewriters()
        self.params: dict[str, Any] = {}

    @property
    def kind(self) -> str:
        return self.prefix

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if not self.errors:
            try:
                self.params = self.check(data)
            except QueueError as exc:
                raise forms.ValidationError(str(exc)) from None
        return data

    def check(self, data: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError


class GateForm(_JobForm):
    kernel = forms.ChoiceField(label="Kernel", help_text="judged on every case of its problem, then timed")
    problem = forms.ChoiceField(required=False)
    against = forms.ChoiceField(label="Baseline", required=False,
                                help_text="a kernel timed beside it, besides the vendor path")
    mode = forms.ChoiceField(label="Gate", choices=MODE_CHOICES, initial="compile")

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["against"].choices = [("", "the vendor path only")] + self.fields["kernel"].choices

    def check(self, data: dict[str, Any]) -> dict[str, Any]:
        return submit.gate_job_params(data["kernel"], problem=data["problem"] or None,
                                      against=data["against"] or None, mode=data["mode"])


class WalkForm(_JobForm):
    kernel = forms.ChoiceField(label="Expert kernel", help_text="walked backward, one gated simplification at a time")
    problem = forms.ChoiceField(required=False)
    rewriter = forms.ChoiceField()
    mode = forms.ChoiceField(label="Gate", choices=MODE_CHOICES, initial="compile")
    # 40, the limit the committed walks ran under: enough for row_softmax/warp_vec4's 23 steps and gemm's 31
    max_steps = forms.IntegerField(label="Most steps", initial=40, min_value=submit.WALK_LIMITS["max_steps"][0],
                                   max_value=submit.WALK_LIMITS["max_steps"][1])
    max_rejections = forms.IntegerField(label="Most rejections in a row", initial=4,
                                        min_value=submit.WALK_LIMITS["max_rejections"][0],
                                        max_value=submit.WALK_LIMITS["max_rejections"][1])

    def check(self, data: dict[str, Any]) -> dict[str, Any]:
        return submit.walk_params(data["kernel"], problem=data["problem"] or None, rewriter=data["rewriter"],
                                  mode=data["mode"], max_steps=data["max_steps"],
                                  max_rejections=data["max_rejections"])


class OptimizeForm(_JobForm):
    kernel = forms.ChoiceField(label="Start kernel", help_text="the kernel the optimization starts from")
    problem = forms.ChoiceField(required=False)
    strategy = forms.ChoiceField(initial=submit.default_strategy)
    rewriter = forms.ChoiceField()
    statuses = forms.MultipleChoiceField(label="Cards with status", initial=["admitted"],
                                         choices=[(s, s) for s in submit.CARD_STATUSES],
                                         # .filters sizes inputs to their column: not a checkbox
                                         widget=forms.CheckboxSelectMultiple(attrs={"style": "width: auto"}))
    library = forms.ChoiceField(label="Skill library", required=False,
                                help_text="whose cards it draws on (libraries are told apart on the Library page)")
    scope = forms.ChoiceField(label="Cards", initial="all", choices=list(submit.LIBRARY_SCOPES.items()))
    budget = forms.IntegerField(label="Gate budget", initial=16, min_value=submit.BUDGET_LIMITS[0],
                                max_value=submit.BUDGET_LIMITS[1], help_text="gate evaluations, the start's included")
    mode = forms.ChoiceField(label="Gate", choices=MODE_CHOICES, initial="compile")
    seed = forms.IntegerField(initial=0, min_value=0, help_text="orders the random strategy's candidates")
    time_limit_min = forms.IntegerField(label="Time limit (minutes)", required=False, min_value=1,
                                        max_value=submit.TIME_LIMITS_S[1] // 60,
                                        help_text="optional: stop gating candidates after this long")

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["strategy"].choices = [(s, s.replace("_", " ")) for s in submit.strategies()]
        self.fields["library"].choices = [(name, name) for name in submit.library_choices()]

    def check(self, data: dict[str, Any]) -> dict[str, Any]:
        # The library select always sends a name; a strategy that draws on no library takes none.
        library = (data["library"] or None) if submit.draws_on_library(data["strategy"]) else None
        return submit.optimize_params(data["kernel"], problem=data["problem"] or None, rewriter=data["rewriter"],
                                      strategy=data["strategy"], statuses=data["statuses"], scope=data["scope"],
                                      budget=data["budget"], mode=data["mode"], seed=data["seed"],
                                      time_limit_s=None if data["time_limit_min"] is None
                                      else data["time_limit_min"] * 60, library=library)


class FitForm(_JobForm):
    kernel = forms.ChoiceField(label="Kernel", help_text="the kernel to match the cards against")
    problem = forms.ChoiceField(required=False)
    library = forms.ChoiceField(label="Skill library")
    statuses = forms.MultipleChoiceField(label="Cards with status", initial=["admitted"],
                                         choices=[(s, s) for s in submit.CARD_STATUSES],
                                         widget=forms.CheckboxSelectMultiple(attrs={"style": "width: auto"}))

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["library"].choices = [(name, name) for name in submit.library_choices()]

    def check(self, data: dict[str, Any]) -> dict[str, Any]:
        return submit.fit_params(data["kernel"], problem=data["problem"] or None, library=data["library"],
                                 statuses=data["statuses"])


class UploadForm(forms.Form):
    problem = forms.FileField(required=False, label="Problem file (.py)",
                              help_text="uploaded/<file name>; probed in the sandboxed runner by a job")
    source = forms.FileField(required=False, label="Kernel source (.cu)", help_text="the file the plan's source names")
    plan = forms.FileField(required=False, label="Launch plan (launch.toml)",
                           help_text="its problem: a bundled one or uploaded/<name>")

    def chosen(self) -> dict[str, uploads.File | None]:
        """The chosen files, read whole (within the page's limits), or None for each left empty."""
        return uploads.received(self.cleaned_data)
