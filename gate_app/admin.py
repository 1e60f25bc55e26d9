from django.contrib import admin

from gate_app.models import Job, Worker


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ("id", "kind", "status", "needs", "attempts", "worker_id", "created_at", "finished_at")
    list_filter = ("status", "kind", "needs")
    search_fields = ("id", "worker_id", "idempotency_key")
    readonly_fields = ("created_at", "started_at", "finished_at", "heartbeat_at", "lease_expires_at")


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = ("worker_id", "host", "gpu", "gpu_name", "capabilities", "seen_at", "stopped_at")
