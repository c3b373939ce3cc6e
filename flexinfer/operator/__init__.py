"""flexinfer.operator"""
