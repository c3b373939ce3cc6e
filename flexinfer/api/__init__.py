"""flexinfer.api"""
