"""flexinfer.backends"""
