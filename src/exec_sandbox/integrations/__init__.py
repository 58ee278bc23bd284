"""Optional adapters for agent frameworks: one module per framework, each importable only when
its extra is installed (`pip install 'exec-sandbox[langchain]'`, ...). See docs/integrations.md."""
