"""KLineage's Django project: settings from the environment, HTTP and WebSocket routing."""
