"""The serving engine: requests, scheduler policies, model runner, step loop."""
