from django.apps import AppConfig


class GateAppConfig(AppConfig):
    name = "gate_app"
    verbose_name = "Gate"
