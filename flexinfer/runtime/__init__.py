"""flexinfer.runtime"""
