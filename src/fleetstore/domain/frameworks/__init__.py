"""What the agent frameworks store (LangGraph checkpoints, OpenAI Agents SDK
items, ADK sessions): their operations and read paths."""
