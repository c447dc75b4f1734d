"""The API's routes, one router per concern (completions, score, models, health and metrics).
They reach the InferenceService and the API keys through FastAPI dependencies (deps.py), which
read what create_app put on app.state: a route holds no state of its own."""
